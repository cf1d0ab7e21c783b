set terminal pngcairo size 960,600 noenhanced
set output '/work/main/docs/fidelity/1-approx-error-error-vs-keep.png'
set title 'Error against K'
set xlabel 'keep K'
set ylabel 'kl_mean (nats), max |logit diff|'
set grid
set key outside right
set logscale y 10
set format y '%g'
$kl0 << EOD
70 3.750520899e-08
100 1.902596183e-09
140 7.032775115e-13
200 9.503420724e-15
253 7.711965022e-15
EOD
$max0 << EOD
70 0.01511390507
100 0.004510134459
140 9.918212891e-05
200 6.675720215e-06
253 6.675720215e-06
EOD
$kl1 << EOD
70 3.750448503e-08
100 1.075031469e-08
140 1.075031469e-08
200 1.075031469e-08
253 1.075031469e-08
EOD
$max1 << EOD
70 0.01511372626
100 0.006716072559
140 0.006716072559
200 0.006716072559
253 0.006716072559
EOD
$kl2 << EOD
70 3.750624009e-08
100 1.90264885e-09
140 7.106499026e-13
200 5.379473434e-14
253 5.344266603e-14
EOD
$max2 << EOD
70 0.01511399448
100 0.004510089755
140 9.894371033e-05
200 7.629394531e-06
253 8.583068848e-06
EOD
$kl3 << EOD
70 3.750556896e-08
100 1.075031469e-08
140 1.075031469e-08
200 1.075031469e-08
253 1.075031469e-08
EOD
$max3 << EOD
70 0.01511381567
100 0.006716072559
140 0.006716072559
200 0.006716072559
253 0.006716072559
EOD
plot $kl0 using 1:2 with linespoints pt 7 lc 1 title 'kl_mean mask H=0', \
     $max0 using 1:2 with linespoints pt 5 dt 2 lc 1 title 'max_abs_logit_diff mask H=0', \
     $kl1 using 1:2 with linespoints pt 7 lc 2 title 'kl_mean mask H=304', \
     $max1 using 1:2 with linespoints pt 5 dt 2 lc 2 title 'max_abs_logit_diff mask H=304', \
     $kl2 using 1:2 with linespoints pt 7 lc 3 title 'kl_mean compact H=0', \
     $max2 using 1:2 with linespoints pt 5 dt 2 lc 3 title 'max_abs_logit_diff compact H=0', \
     $kl3 using 1:2 with linespoints pt 7 lc 4 title 'kl_mean compact H=304', \
     $max3 using 1:2 with linespoints pt 5 dt 2 lc 4 title 'max_abs_logit_diff compact H=304'
set output
