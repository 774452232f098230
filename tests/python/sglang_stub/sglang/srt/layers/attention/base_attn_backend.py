# Test stub: the replay signature of SGLang's AttentionBackend (names only, no behaviour).


class AttentionBackend:
    def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens,
                                                seq_lens_sum, encoder_lens, forward_mode,
                                                spec_info, seq_lens_cpu):
        raise NotImplementedError()
