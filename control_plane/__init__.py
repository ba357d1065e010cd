"""The asyncio control plane: the gRPC API (`api`), the job and agent state it
keeps (`controller`), straggler detection (`detector`) and the pure decision
of when to replan (`coordinator`)."""
