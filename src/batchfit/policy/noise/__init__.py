"""The gradient noise scale and what it buys, free of torch: the two-batch estimator, how far scaling the
batch pays, and goodput (which batch trains fastest to a target)."""
