"""The largest batch on GPUs you do not have (``predict``): the verb, what it is asked and answers
(``Targets``, ``Prediction``), and what the CPU adds when it stands in alone for CUDA. The decisions are
``policy.capacity``'s."""
