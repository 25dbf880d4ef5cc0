"""Whether data loading holds training back, and the DataLoader setting that stops it (``check_data``): the
verb. The decisions are ``policy.explore.loader_settings``."""
