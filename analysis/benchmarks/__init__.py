"""Benchmarks, ratios side by side in one run: jaxpar's step against an auto-sharded jit step
and PyTorch (`bench`, `profile`, `torch_peer`, `bench_table`), the input pipeline
(`input_bench`), both convolution lowerings (`conv_bench`)."""
