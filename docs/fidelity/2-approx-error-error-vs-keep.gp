set terminal pngcairo size 960,600 noenhanced
set output '/work/main/docs/fidelity/2-approx-error-error-vs-keep.png'
set title 'Error against K'
set xlabel 'keep K'
set ylabel 'kl_mean (nats), max |logit diff|'
set grid
set key outside right
set logscale y 10
set format y '%g'
$kl0 << EOD
70 2.338154257e-08
100 6.390476912e-10
140 2.855841328e-13
200 8.576433798e-15
253 3.962205629e-15
EOD
$max0 << EOD
70 0.02403867245
100 0.005509540439
140 8.916854858e-05
200 6.675720215e-06
253 5.722045898e-06
EOD
$kl1 << EOD
70 2.338173664e-08
100 7.69434155e-09
140 7.69434155e-09
200 7.69434155e-09
253 7.69434155e-09
EOD
$max1 << EOD
70 0.02403843403
100 0.02560138702
140 0.02560138702
200 0.02560138702
253 0.02560138702
EOD
$kl2 << EOD
70 2.338162817e-08
100 6.389968174e-10
140 2.931561869e-13
200 6.001879856e-14
253 5.811862047e-14
EOD
$max2 << EOD
70 0.02403879166
100 0.005509734154
140 8.927285671e-05
200 9.536743164e-06
253 8.583068848e-06
EOD
$kl3 << EOD
70 2.338167737e-08
100 7.69434155e-09
140 7.69434155e-09
200 7.69434155e-09
253 7.69434155e-09
EOD
$max3 << EOD
70 0.02403891087
100 0.02560138702
140 0.02560138702
200 0.02560138702
253 0.02560138702
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
