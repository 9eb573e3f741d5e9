"""How a node starts its processes: torchrun, ``accelerate launch`` (and its config file), and the strategies
that pair a launcher with a bundled example. Pure: argv and file texts. Imports ``launch.core`` only: what the
backend decides (how a node learns its rank) is handed in.
"""
