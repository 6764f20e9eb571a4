"""Many judgements: the hypothesis engine and its rounds, distinct bugs, the corpus, worker processes and the
messages between them, --jobs (a transport and a scheduling policy), combined summaries."""
