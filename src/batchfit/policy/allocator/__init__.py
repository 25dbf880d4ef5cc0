"""PyTorch's caching allocator, modelled free of torch: the requests a trial records, the allocator (its
blocks, its expandable segments) they are replayed on, and when a trial's later steps only repeat its
first. It knows nothing of a search: ``policy.search`` reads it."""
