namespace mla::testing { int placeholder = 0; }
