"""vLLM's own tests as the series' gate: the tests of a release's sdist for every module the series
edits, run on the stock and the patched copy of that release, outcomes compared per test id.

selection (which tests: from what the series edits) -> run (a tree, a pytest run, its outcomes) ->
compare (per id) -> blame (which patch, by leaving one out at a time) -> record (the figures).
"""
