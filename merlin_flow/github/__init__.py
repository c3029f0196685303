"""The GitHub loop: an issue or a comment in, a plan, progress and a draft pull request out."""
