"""The gradient noise scale of a workload's own training step (``noise_scale``): the verb and its answer
(``NoiseScaleResult``). The estimator, the monitor and the batch schedule are ``policy.noise``'s."""
