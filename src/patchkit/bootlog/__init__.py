"""Boot-log judgement, shared by the live smoke and `patchkit doctor`: the markers vLLM logs, the fatal
causes with their fixes, and the verdict on one log."""
