from specbuild.engines.server import ServerOptions
from specbuild.infra.joblog import start_job_log
from specbuild.serve import pick_chain, serve_command, write_serve_script

start_job_log(snakemake.log[0])
server = ServerOptions(**snakemake.params.server)
chain, why = pick_chain(snakemake.params.chains, list(snakemake.input.rows))
write_serve_script(
    snakemake.output[0],
    command=serve_command(
        fingerprint=snakemake.input.fp,
        drafter_config=snakemake.input.drafter[0],
        chain=chain,
        server=server,
        port=snakemake.params.port,
    ),
    env=server.env,
    why=why,
    host=server.host,
    api_key_env=snakemake.params.api_key_env,
)
