from eagleforensics.cli import main

main()
