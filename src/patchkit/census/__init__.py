"""The kernel census: which compiled kernels a release's wheels carry for GB10 (`kernels`, read off the
wheels' cubins), and what the JIT kernels a Spark compiles at first use cost there (`jit_census`, with
`jit_units` naming what is compiled and `ptxas` reading its resource use). `patchkit census`."""
