"""A user's project: the files ``agentscope-serverless init`` writes, and how packaging reads
a project folder (its code, its ``requirements.txt``)."""
