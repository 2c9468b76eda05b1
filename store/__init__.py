"""What a run writes and how it survives being stopped: resumable JSON Lines run files, atomic outputs and the
checks before any of them (runs), advisory locks on run files and output folders (locks), and which process of a
launch is the one that writes (processes). Imports only cli."""
