"""What a DGX Spark needs before its first serve (`patchkit doctor host`): the tools it must have, read
locally or over ssh, each check named with its fix."""
