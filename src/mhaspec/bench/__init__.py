"""Benchmarks of the in-repo backends: ``mhaspec bench [--quick]`` (or ``nox -s bench``).

Times the forward pass (and forward + backward for the PyTorch variants) of every registered
backend variant and of PyTorch's own ``nn.MultiheadAttention`` and ``scaled_dot_product_attention``
at the source document's size (B=32, L=50, d_model=512, h=8, float32, CPU) and over a sweep of L,
with achieved GFLOP/s against this machine's matmul throughput and peak memory per configuration,
each measured in a fresh subprocess. ``--help`` lists the options.
"""
