"""What the timing verbs decide, free of torch: explore's rounds and contenders, the throughput estimates
and the chooser, the speed ratios, the techniques compare applies, an exploration not settled, what
advise tells the user to change, the DataLoader settings check-data tries, and the time budget every
timing verb keeps."""
