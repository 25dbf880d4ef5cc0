"""Training throughput against batch size (``explore``): the verb that times the sizes. The decisions
(which sizes, in which rounds, when to stop) are ``policy.explore``'s."""
