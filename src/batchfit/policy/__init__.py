"""The decisions, free of torch: the search, the throughput chooser, explore's rounds, the plan.

Each is a policy over an injected oracle (a trial, a timing window), so it is tested against
brute force on synthetic curves without running a model.
"""
