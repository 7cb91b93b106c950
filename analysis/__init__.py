"""What the thesis asks — which scheme, server and number of workers reach a result soonest
on this hardware — answered by job, one package each:

  theory      [T]'s timing and speedup equations, [S]'s and [H]'s models; the thesis'
              `estimate` CLI and its predictions beside its published results
  steptime    a step's time measured on this machine (`measure`), predicted from separately
              measured parts and judged on held-out points (`compare`)
  accuracy    the steps each scheme needs to reach a target, modelled and multiplied by the
              step time (`tta`)
  benchmarks  jaxpar's step against an auto-sharded jit step and PyTorch, the input
              pipeline and the convolution lowerings

`report/` holds the committed measurements and what was made from them.
"""
