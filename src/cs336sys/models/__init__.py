"""Floor 1, models: what is measured — TransformerLM and its size table, the attention cores
(eager, SDPA, our Triton kernels), the Performer, the mha layer, the optimizers and precision
settings. Torch only; nothing here knows about cells, configs or reports. ``variants`` names
every variant and valid combination without importing torch.
"""
