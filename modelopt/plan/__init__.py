"""What a search decides: a plan, its file form, the search space and a scored trial."""
