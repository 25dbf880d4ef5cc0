"""A training run planned around its batch, free of torch: at the start (the micro-batch and accumulation,
the scaled learning rate and warm-up and the rules behind them) and as it goes (the batch schedule that
grows the batch on the noise scale, and the monitor that reads it every N steps)."""
