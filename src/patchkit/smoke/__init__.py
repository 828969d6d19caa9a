"""The smoke: prove a variant loads, on CPU (tiny real-format checkpoints through the real vLLM
quantization code) or on real hosts (the serve command booted in the image, its log and API judged)."""
