"""The board side: transports (local for the simulator board, SSH for an EVK), doctor, push."""
