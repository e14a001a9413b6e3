"""The promise a run makes, in one room: what each split can certify (`evidence`), the confirmation sequences
planned on val (`sequence`) and run on the confirm split (`confirm`), and the check that the plan a user deploys
answers as the certified one did (`deployed`). The bounds themselves: `modelopt.confidence`; feasibility:
`modelopt.objective`.

Import from the modules: this package loads none of them.
"""
