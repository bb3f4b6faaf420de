"""Answer checks for the course exercises, one module per lesson (lessonNN.py)."""
