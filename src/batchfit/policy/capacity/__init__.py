"""The largest batch on a GPU of another size, free of torch: a few small trials' requests replayed at the
target's memory (``capacity_prediction``), and the cards a prediction can name."""
