"""Everything the two trainers share that is not about distribution."""
