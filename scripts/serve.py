from specbuild.joblog import start_job_log
from specbuild.serve import pick_chain, serve_command, write_serve_script

start_job_log(snakemake.log[0])
chain, why = pick_chain(snakemake.params.chains, list(snakemake.input.summaries))
write_serve_script(
    snakemake.output[0],
    command=serve_command(
        fingerprint=snakemake.input.fp,
        drafter_config=snakemake.input.drafter[0],
        chain=chain,
        launcher=snakemake.params.launcher,
        server_args=snakemake.params.server_args,
        host=snakemake.params.host,
        port=snakemake.params.port,
    ),
    env=snakemake.params.env,
    why=why,
)
