"""Checkpoint inspection: a checkpoint as stored (identity pins, safetensors headers, tensor names, its
quantization config) and as the pinned vLLM will load it (preflight, the serve command, the MTP ignore)."""
