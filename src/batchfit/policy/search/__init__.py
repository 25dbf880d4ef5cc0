"""The search, free of torch: the largest batch a ``run(batch) -> Trial`` oracle accepts (``search``), the
state its strategies change, the trials and their records, the forecast it reads from their replay on
the modelled allocator, the safe band below the answer, and what the ranks of a lockstep search agree
on."""
