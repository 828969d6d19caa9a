"""patchkit: anchor-asserted, fail-closed patches for vLLM, built into reproducible images."""

from pathlib import Path

__version__ = "0.1.0"

# The checkout patchkit runs from (src layout): patches/ and images/ live here, they are not packaged.
CHECKOUT = Path(__file__).resolve().parents[2]

# The release the patch set is pinned to: the default source of `check` and `diff`, the baseline of
# `verify`, the release the whole suite runs on. Its FlashInfer comes from the companion policy
# (sources/companion.py): 0.34.0 pins flashinfer-python 0.7.3, which was never published, so the published
# 0.7.2.post1 of the same minor is checked in its place and every report says so.
PINNED_VLLM = "0.34.0"
# Every release the patch set supports, oldest first: what a patch's `vllm` range may claim, what nox
# builds a test environment for, and where the boot-log markers' literals are read.
SUPPORTED_VLLM = ("0.30.0", "0.31.0", "0.32.0", "0.33.0", PINNED_VLLM)
PINNED_SOURCES = (f"vllm=={PINNED_VLLM}",)
