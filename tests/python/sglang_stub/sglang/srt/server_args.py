ATTENTION_BACKEND_CHOICES = ["flashinfer", "triton", "fa3", "flashmla"]


def add_attention_backend_choices(choices):
    ATTENTION_BACKEND_CHOICES.extend(choices)
