"""Devices and their memory: the CPU, the capped CPU, CUDA and the caching allocator behind it
(real or modelled), resolving what the user names, counting storages, the host's limits, and
recognising an out-of-memory."""
