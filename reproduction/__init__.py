"""The reproduction: a research tool beside the package (like tools/), run from the repository root as
`python -m reproduction.reproduce` (`make reproduce`). It imports only public names of `scalerl_mega`; nothing in
`scalerl_mega` imports it. reproduction/README.md describes the designs and the data policy."""
