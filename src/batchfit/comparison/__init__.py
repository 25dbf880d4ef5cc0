"""What each technique buys on the user's own model (``compare``): the verb and its rows (``Comparison``).
Which techniques apply, and the ratios read, are ``policy.explore``'s."""
