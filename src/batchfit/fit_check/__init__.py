"""Whether a workload still fits a batch size in a memory, with its margin (``check``, the CI guard): the
verb and its answer (``FitCheck``)."""
