"""sparse-mla-tuner: feasibility, search, measurement and queries for the sparse MLA decode kernel."""

__version__ = "0.1.0"
