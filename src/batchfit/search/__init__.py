"""The search for the largest batch that fits (``find_batch_size``, the ``find`` command): the verb, its
answer (``SearchResult``), the capacity it is given, the oracle that runs its trials, and a saved
prediction as its starting evidence. The decisions are ``policy.search``'s and ``policy.allocator``'s."""
