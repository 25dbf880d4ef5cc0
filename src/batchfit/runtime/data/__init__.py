"""Data loading: building the DataLoaders the data check tries, and timing the loader, the step
and the two together."""
