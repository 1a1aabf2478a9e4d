from eagleforensics.cli import run

run()
