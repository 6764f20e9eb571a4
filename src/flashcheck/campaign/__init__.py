"""Many judgements: the hypothesis engine and its rounds, distinct bugs, the corpus, worker processes, --jobs,
merged summaries."""
