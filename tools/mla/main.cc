// Placeholder: the CLI lands with the foundation issue.
#include <cstdio>
int main() { std::puts("mla"); return 0; }
