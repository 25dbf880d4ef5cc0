"""The decisions, free of torch, in rooms by concern; each room imports only the rooms named after it:

- ``search``: the largest batch an oracle accepts, its trials and their replayed forecast (allocator);
- ``allocator``: PyTorch's caching allocator, modelled (none);
- ``capacity``: the largest batch on a GPU of another size (search, allocator);
- ``explore``: what the timing verbs decide: explore's rounds, the chooser, speed ratios, compare's
  techniques, advise's ranking, check-data's loader settings, the time budget (none);
- ``noise``: the gradient noise scale, scaling's payoff, goodput (explore);
- ``plan``: the run planned around its batch, and the batch schedule during it (noise).

Each is a policy over an injected oracle (a trial, a timing window), so it is tested against
brute force on synthetic curves without running a model.
"""
