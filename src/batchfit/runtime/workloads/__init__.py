"""What a trial runs (``Workload``), the built-in examples, and loading a workload from a
``module:function`` spec."""
