"""The promise a run makes, in one room. One entry, `certificate.certify`: from a search's trials to the plan a
run may report and its held-out figures. Its parts: what each split can certify (`evidence`), the confirmation
sequences planned on val (`sequence`) and run on the confirm split (`confirm`), and the check that the plan a
user deploys answers as the certified one did (`deployed`). The bounds themselves: `modelopt.confidence`;
feasibility and the target: `modelopt.objective`. The split names: `modelopt.data.split.Split`.

Import from the modules: this package loads none of them.
"""
