"""Following upstream vLLM: the state of each patch's upstream PR or issue (`upstream_state`), UPSTREAM.md
rendered from the patches' [upstream] tables (`upstream_md`), which
patches a release made unnecessary (`retire`), a test run's record (`run_record`), and the daily bump job
that reads all of them back (`bump`, its records typed once in `bump_records`). The matrix itself is
`verify`; the kernel census is `census`; a rebase is `patching.rebase`."""
