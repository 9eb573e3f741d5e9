"""How a node starts its processes: torchrun, ``accelerate launch`` (and its config file), and the strategies
that pair a launcher with a bundled example. Pure: argv and file texts. Imports ``launch.core``, and asks the
backends' registry (``launch.backends``) how a node learns its rank.
"""
