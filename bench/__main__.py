from .cli import main
from .runargs import run

run(main)
