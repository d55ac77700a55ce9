"""Agent turns in the proxy: classifying requests (classify.py) and keeping the turns
table as cycles are recorded (tracker.py); docs/concepts/turns.md."""
