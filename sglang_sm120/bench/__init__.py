"""`sglang-sm120 bench`: the DeepSeek-V4-Flash decode-step benchmark (ours vs upstream, and a labelled sm_120 projection)."""
