"""One-off studies: questions answered once, with their frozen results in experiments/results/.

Each study module's docstring begins with the question it answered and the answer;
run one from the checkout's root with `python -m experiments.<name>`.
"""
