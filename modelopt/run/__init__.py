"""A search run on disk: the loop (`runner`), its journal and locks, the folder's layout, and the read-only views
reports use (`run_folder`, `sweep_folder`); what a run certifies lives in `modelopt.certify`.

Import from the modules (`modelopt.run.runner.Runner`, `modelopt.run.run_folder.read_run`): this
package loads none of them, so a module that needs one part (the layout) does not load the loop.
"""
